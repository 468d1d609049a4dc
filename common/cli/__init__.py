"""The `dpda` command line: argument parsing, the daemons' commands, the demo."""
