"""The experiment runner behind ``python -m experiments.run`` (see experiments/run.py).

``execute`` runs a definition into a results dict, ``render`` turns results into figures and
the README's results section, ``readme_check`` holds a README to its results.json.
"""
