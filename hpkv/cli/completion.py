"""Static shell completion scripts generated from the Typer app.

The scripts embed the command tree (commands, options, option choices), so pressing Tab never
starts Python. ``scripts/gen-completions.py`` writes them to ``completions/``; a test fails when
the committed files differ from what the app generates.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

PROG = "hpkv"
FILE_OPTIONS = {"--config", "--kubeconfig", "--results-dir", "--output-dir", "--bundle", "--trace"}


@dataclass
class OptionSpec:
    names: list[str]
    takes_value: bool
    choices: list[str] = field(default_factory=list)
    help: str = ""

    @property
    def is_file(self) -> bool:
        return any(n in FILE_OPTIONS for n in self.names)


@dataclass
class CommandSpec:
    path: list[str]
    help: str
    options: list[OptionSpec]
    subcommands: dict[str, CommandSpec] = field(default_factory=dict)

    @property
    def key(self) -> str:
        return " ".join(self.path)


def _first_line(text: str | None) -> str:
    line = (text or "").strip().splitlines()[0] if (text or "").strip() else ""
    return line.replace("'", "").replace('"', "").replace("`", "")[:70]


def _choices(param: Any) -> list[str]:
    import enum
    import typing

    descriptor = getattr(param, "type_descriptor", None)
    annotation = getattr(descriptor, "annotation", None)
    candidates = [annotation, *typing.get_args(annotation)]
    for candidate in candidates:
        if isinstance(candidate, type) and issubclass(candidate, enum.Enum):
            return [str(member.value) for member in candidate]
        if typing.get_origin(candidate) is typing.Literal:
            return [str(v) for v in typing.get_args(candidate)]
    return []


def _options(command: Any) -> list[OptionSpec]:
    specs = []
    for param in command.params:
        if getattr(param, "param_type_name", "") != "option" or getattr(param, "hidden", False):
            continue
        names = list(param.opts) + list(getattr(param, "secondary_opts", []))
        choices = _choices(param)
        takes_value = not getattr(param, "is_flag", False) and not getattr(param, "count", False)
        specs.append(OptionSpec(sorted(names), takes_value, choices, _first_line(param.help)))
    specs.append(OptionSpec(["--help", "-h"], False, [], "Show help and exit."))
    return specs


def command_tree() -> CommandSpec:
    import typer

    from hpkv.cli.main import app

    root = typer.main.get_command(app)

    def walk(command: Any, path: list[str]) -> CommandSpec:
        spec = CommandSpec(path, _first_line(command.help), _options(command))
        for name in sorted(getattr(command, "commands", {}) or {}):
            sub = command.commands[name]
            if getattr(sub, "hidden", False):
                continue
            spec.subcommands[name] = walk(sub, [*path, name])
        return spec

    return walk(root, [])


def _all(spec: CommandSpec) -> list[CommandSpec]:
    out = [spec]
    for sub in spec.subcommands.values():
        out += _all(sub)
    return out


def _value_options(tree: CommandSpec) -> list[str]:
    names: set[str] = set()
    for spec in _all(tree):
        for option in spec.options:
            if option.takes_value:
                names.update(option.names)
    return sorted(names)


def _shell_words(words: list[str]) -> str:
    return " ".join(words)


def _subcommand_steps(tree: CommandSpec) -> list[tuple[str, str, str]]:
    """(command path, subcommand, the path after it) for every subcommand in the tree."""
    return [
        (spec.key, name, (spec.key + " " if spec.key else "") + name)
        for spec in _all(tree)
        for name in spec.subcommands
    ]


def _file_option_names(tree: CommandSpec) -> list[str]:
    return [n for spec in _all(tree) for o in spec.options if o.is_file for n in o.names]


def _choice_options(tree: CommandSpec) -> list[tuple[str, list[str]]]:
    """(option name, its choices), each name once (its first definition)."""
    found: dict[str, list[str]] = {}
    for spec in _all(tree):
        for option in spec.options:
            if option.choices:
                for n in option.names:
                    found.setdefault(n, option.choices)
    return list(found.items())


def _sh_command_path(tree: CommandSpec, first_index: int, words: str, cursor: str) -> list[str]:
    """bash/zsh: the loop that finds the command path in the words before the cursor, skipping
    options and the values of options that take one."""
    lines = [
        '    local cmdpath="" word i',
        f'    local value_opts=" {_shell_words(_value_options(tree))} "',
        f"    for ((i = {first_index}; i < {cursor}; i++)); do",
        f'        word="${{{words}[i]}}"',
        '        if [[ "$word" == -* ]]; then',
        '            [[ "$word" != *=* && "$value_opts" == *" $word "* ]] && ((i++))',
        "            continue",
        "        fi",
        '        case "$cmdpath|$word" in',
    ]
    lines += [
        f'            "{key}|{name}") cmdpath="{new}" ;;'
        for key, name, new in _subcommand_steps(tree)
    ]
    return [*lines, "        esac", "    done"]


def bash_script(tree: CommandSpec) -> str:
    globals_ = [n for o in tree.options for n in o.names]
    lines = [
        "# bash completion for hpkv (generated by scripts/gen-completions.py; do not edit)",
        "_hpkv_completion() {",
        '    local cur="${COMP_WORDS[COMP_CWORD]}" prev="${COMP_WORDS[COMP_CWORD-1]}"',
    ]
    lines += _sh_command_path(tree, 1, "COMP_WORDS", "COMP_CWORD")
    lines.append('    case "$prev" in')
    lines += [
        f'        {n}) COMPREPLY=($(compgen -f -- "$cur")); return 0 ;;'
        for n in _file_option_names(tree)
    ]
    lines += [
        f'        {n}) COMPREPLY=($(compgen -W "{_shell_words(choices)}" -- "$cur")); return 0 ;;'
        for n, choices in _choice_options(tree)
    ]
    lines += ["    esac", "    local words", '    case "$cmdpath" in']
    for spec in _all(tree):
        options = [n for o in spec.options for n in o.names]
        if spec.path:
            options += globals_
        candidates = (
            sorted(set(options))
            if not spec.subcommands
            else list(spec.subcommands) + sorted(set(options))
        )
        lines.append(f'        "{spec.key}") words="{_shell_words(candidates)}" ;;')
    lines += [
        "    esac",
        '    COMPREPLY=($(compgen -W "$words" -- "$cur"))',
        "}",
        f"complete -o default -F _hpkv_completion {PROG}",
        "",
    ]
    return "\n".join(lines)


def zsh_script(tree: CommandSpec) -> str:
    lines = [
        f"#compdef {PROG}",
        "# zsh completion for hpkv (generated by scripts/gen-completions.py; do not edit)",
        "_hpkv() {",
    ]
    lines += _sh_command_path(tree, 2, "words", "CURRENT")
    lines += ['    local prev="${words[CURRENT-1]}"', '    case "$prev" in']
    lines += [f"        {n}) _files; return ;;" for n in _file_option_names(tree)]
    lines += [
        f"        {n}) compadd -- {_shell_words(choices)}; return ;;"
        for n, choices in _choice_options(tree)
    ]
    lines += ["    esac", "    local -a cmds opts", '    case "$cmdpath" in']
    globals_ = [n for o in tree.options for n in o.names]
    for spec in _all(tree):
        cmds = [f"'{name}:{sub.help}'" for name, sub in spec.subcommands.items()]
        opts = sorted(
            {n for o in spec.options for n in o.names} | (set(globals_) if spec.path else set())
        )
        lines.append(
            f'        "{spec.key}") cmds=({" ".join(cmds)}); opts=({_shell_words(opts)}) ;;'
        )
    lines += [
        "    esac",
        '    if [[ "$PREFIX" == -* ]]; then',
        "        compadd -- $opts",
        "    elif (( ${#cmds} )); then",
        "        _describe 'command' cmds",
        "    else",
        "        _files",
        "    fi",
        "}",
        '_hpkv "$@"',
        "",
    ]
    return "\n".join(lines)


def fish_script(tree: CommandSpec) -> str:
    lines = [
        "# fish completion for hpkv (generated by scripts/gen-completions.py; do not edit)",
        "function __hpkv_path",
        "    set -l tokens (commandline -opc)",
        '    set -l cmdpath ""',
        f"    set -l value_opts {_shell_words(_value_options(tree))}",
        "    set -l skip 0",
        "    for word in $tokens[2..-1]",
        "        if test $skip -eq 1",
        "            set skip 0",
        "            continue",
        "        end",
        "        if string match -q -- '-*' $word",
        "            if contains -- $word $value_opts",
        "                set skip 1",
        "            end",
        "            continue",
        "        end",
        '        switch "$cmdpath|$word"',
    ]
    for key, name, new in _subcommand_steps(tree):
        lines += [f"            case '{key}|{name}'", f"                set cmdpath '{new}'"]
    lines += ["        end", "    end", '    echo "$cmdpath"', "end", "", f"complete -c {PROG} -f"]
    globals_ = tree.options
    for spec in _all(tree):
        cond = f"test (__hpkv_path) = '{spec.key}'"
        for name, sub in spec.subcommands.items():
            lines.append(f'complete -c {PROG} -n "{cond}" -a {name} -d "{sub.help}"')
        for option in spec.options + (globals_ if spec.path else []):
            parts = []
            for n in option.names:
                if n.startswith("--"):
                    parts.append(f"-l {n[2:]}")
                elif n.startswith("-"):
                    parts.append(f"-s {n[1:]}")
            value = ""
            if option.takes_value:
                value = " -r -F" if option.is_file else " -r"
                if option.choices:
                    value = f' -x -a "{_shell_words(option.choices)}"'
            help_text = f' -d "{option.help}"' if option.help else ""
            lines.append(f'complete -c {PROG} -n "{cond}" {" ".join(parts)}{value}{help_text}')
    lines.append("")
    return "\n".join(lines)


def render_all() -> dict[str, str]:
    tree = command_tree()
    return {
        "hpkv.bash": bash_script(tree),
        "_hpkv": zsh_script(tree),
        "hpkv.fish": fish_script(tree),
    }
