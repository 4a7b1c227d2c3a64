"""The web console served by rm-server (docs/operations.md, "Web console")."""
