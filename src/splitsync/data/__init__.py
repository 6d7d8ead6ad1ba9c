"""Data: the map-style loader, its permutation, and streams."""
