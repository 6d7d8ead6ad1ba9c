# ruff: noqa  (a fixture written in the idiom of a public training script, style included)
"""YOLO's utils/general.py idiom: the log level is chosen from the rank once."""
import logging


def set_logging(rank=-1):
    logging.basicConfig(format="%(message)s",
                        level=logging.INFO if rank in [-1, 0] else logging.WARN)
