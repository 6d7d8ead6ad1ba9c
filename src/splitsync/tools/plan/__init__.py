"""``splitsync plan``'s model of data-parallel scaling (``plan.costmodel``), pure Python.

Kept apart from ``bench`` so that predicting needs neither torch nor the benchmark
workloads; ``bench`` only imports it to check its predictions against measurements.
"""
