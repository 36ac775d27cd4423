"""The course in a classroom and on the web: slide metadata from a spec, the course map, the
measured run times, and the static site built from the executed notebooks."""
