"""Developer scripts (`make run` runs `python -m scripts.dev`)."""
