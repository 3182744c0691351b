"""The HTTP face's kit, shared by every router of it (ingest_gateway.routes, consumer_api, console):
the status table and the HTTP-only errors (`errors`), path, query and header parameters (`params`),
the dependencies (`dependencies`), forwarding to a group's coordinator (`forwarding`) and the JSON
body reader (`json_body`)."""
