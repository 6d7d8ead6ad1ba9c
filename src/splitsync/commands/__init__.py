"""Subcommands of the splitsync command line, one module each."""
