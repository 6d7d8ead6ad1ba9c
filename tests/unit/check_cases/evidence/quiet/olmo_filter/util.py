# ruff: noqa  (a fixture written in the idiom of a public training script, style included)
"""OLMo's olmo/util.py idiom: `prepare_cli_environment()` installs a logging filter that
drops INFO records off rank 0."""
import logging
import os


def get_global_rank():
    return int(os.environ.get("RANK", 0))


def setup_logging():
    handler = logging.StreamHandler()

    def rank0_filter(record):
        if record.levelno > logging.INFO:
            return 1
        return 1 if get_global_rank() == 0 else 0

    filter = rank0_filter
    handler.addFilter(filter)
    logging.basicConfig(handlers=[handler], level=logging.INFO)


def prepare_cli_environment():
    setup_logging()
