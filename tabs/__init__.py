"""The app's tabs that have a module of their own: each builds its layout and wires its events (build), with its
handlers beside it; app.py composes them. The math lives in codeckv, each request's work in codeckv/serve."""
