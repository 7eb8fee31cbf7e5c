"""Launching: ``pace serve`` arguments, engine instances (a thread, pinned processes, Ray
Serve replicas) and what the front door knows of them, running a server in a thread."""
