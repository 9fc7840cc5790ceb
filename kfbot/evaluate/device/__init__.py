"""Code that runs inside the isolated GPU worker: the only place torch meets a candidate."""
