"""Subcommands of the ``ollie`` CLI, one module each (``add_arguments`` + ``run``)."""
