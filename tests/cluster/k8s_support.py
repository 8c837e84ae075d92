"""Values shared by the Kubernetes tests and their fixtures."""

#: The fake API server's bearer token; tests assert it never appears in output.
TOKEN = "tok-3f9c1d2e-never-logged"
