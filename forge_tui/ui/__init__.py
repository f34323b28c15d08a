"""The Textual app. The only package that imports textual; it subscribes to the core's events."""
