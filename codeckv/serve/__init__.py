"""What the app's requests do: validate every input at the edge (inputs, limits), run the measurement
(service), hold sessions and models within bounds (sessions, pool), and phrase the results (formatting).

app.py wires these to Gradio; nothing here draws a layout.
"""
