"""Python client SDK for labelrm."""
