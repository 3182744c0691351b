"""Spark maintenance jobs: retention and compaction (`python -m jobs.<job>`)."""
