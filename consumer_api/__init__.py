"""The consume routers of the HTTP face: fetch by offset (JSON or Arrow, long-poll), offset
lookups, Server-Sent Events, and consumer groups (join, heartbeat, commit, lag). They use the HTTP
face's kit (ingest_gateway.kit) and the broker's services."""
