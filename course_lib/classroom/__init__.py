"""The course in a classroom and on the web: slide metadata from a spec, the course map, the
measured run times, the static site built from the executed notebooks, and notebooks stored as
JupyterLab saves them (``notebook_format``), so that opening a deck leaves the checkout clean."""
