"""The core's own features, registered through the public hooks like any third-party plugin."""
