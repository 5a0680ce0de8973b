"""The command line's subcommands, one module each: ``simulate``,
``compare``, ``tune``, ``calibrate``. Each turns its flags into run specs
(:mod:`kvsched.sim.flags`) and prints, saves or draws what the layers below
compute; :mod:`kvsched.cli` puts them together."""


def help_description(doc: str | None) -> str | None:
    """A command's ``--help`` description: its module docstring's first
    paragraph on one line (the whole sentence, not its first line)."""
    if not doc:
        return None
    paragraph = doc.strip().split("\n\n")[0]
    return " ".join(line.strip() for line in paragraph.splitlines()).replace("``", "")
