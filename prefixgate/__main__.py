"""``python -m prefixgate ...`` is the ``prefixgate`` command."""

from prefixgate.proxy.cli import app

if __name__ == "__main__":
    app()
