"""Output: readable tables, JSON files, figures, the self-contained HTML report and the
export of a simulated run as a PyTorch memory snapshot."""
