"""`python -m app.curves`: the old name of `python -m curves`, kept working.

The analysis lives in the top-level `curves` package (it imports nothing from the app).
"""
