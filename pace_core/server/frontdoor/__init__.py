"""The front door: the ``Server`` the routes work with, routing to engine instances, queue
limits, event fan-out and metrics."""
