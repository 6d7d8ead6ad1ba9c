"""The process group and what each process knows of it: environment, devices, collectives, seeds, logs."""
