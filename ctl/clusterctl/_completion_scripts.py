"""The completion scripts: a `Grammar` (see _completion_grammar.py) written as each shell's tables,
then one fixed function per shell that reads them. Every function does the same walk over the
words before the cursor: a known subcommand descends (before any positional argument), an
option that takes a value makes the next word its value (`--opt=value` takes its own), `--`
ends the options; then the word at the cursor is completed as an option, a subcommand, or the
slot it fills (see Grammar.slots)."""

from __future__ import annotations

from clusterctl._completion_grammar import CLUSTERS, FILES, NOTHING, REPEATED, Grammar

TYPE_CHECKING = False  # typing, for the type checker alone
if TYPE_CHECKING:
    from collections.abc import Callable

NAMES = "clusterctl completion --cluster-names 2>/dev/null"


def _single(text: str) -> str:
    """`text` in single quotes, for bash and zsh."""
    return "'" + text.replace("'", "'\\''") + "'"


def _fish(text: str) -> str:
    """`text` in single quotes, for fish (which escapes \\ and ' inside them)."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _tables(grammar: Grammar, *, described: str | None
            ) -> dict[str, dict[str, str]]:
    """The four tables, each a map of key to one string: names joined by spaces, or with
    `described` (a separator), "name{described}help" entries on lines of their own."""
    def entries(pairs: list[tuple[str, str]]) -> str:
        if described is None:
            return " ".join(name for name, _ in pairs)
        return "\n".join(f"{name}{described}{text}" for name, text in pairs)

    return {
        "subs": {path: entries(pairs) for path, pairs in grammar.subcommands.items()},
        "opts": {path: entries(pairs) for path, pairs in grammar.options.items()},
        "valued": {path: " ".join(flags) for path, flags in grammar.valued.items()},
        "slots": dict(grammar.slots),
    }


def _assoc(tables: dict[str, dict[str, str]], declare: str) -> str:
    lines = []
    for name, table in tables.items():
        pairs = " ".join(f"[{_single(k)}]={_single(v)}" for k, v in table.items())
        lines.append(f"{declare} _clusterctl_{name}=({pairs})")
    return "\n".join(lines)


BASH = r"""# bash completion for clusterctl, made by `clusterctl completion bash` from its parser.
# Use: source <(clusterctl completion bash)
%(tables)s

_clusterctl() {
    local cur=${COMP_WORDS[COMP_CWORD]} cmd=clusterctl w i=1 npos=0 value= ended= slot
    while (( i < COMP_CWORD )); do
        w=${COMP_WORDS[i]}; i=$((i + 1))
        if [[ $w == = ]]; then value=1; continue; fi  # bash splits --opt=value at the =
        if [[ -n $value ]]; then value=; continue; fi
        if [[ -z $ended && $w == -- ]]; then ended=1; continue; fi
        if [[ -z $ended && $w == -* ]]; then
            [[ $w != *=* && " ${_clusterctl_valued[$cmd]} " == *" $w "* ]] && value=1
            continue
        fi
        if (( npos == 0 )) && [[ " ${_clusterctl_subs[$cmd]} " == *" $w "* ]]; then
            cmd="$cmd $w"; continue
        fi
        npos=$((npos + 1))
    done
    if [[ $cur == = ]]; then cur=; value=1; fi
    COMPREPLY=()
    if [[ -n $value ]]; then
        w=${COMP_WORDS[COMP_CWORD-1]}; [[ $w == = ]] && w=${COMP_WORDS[COMP_CWORD-2]}
        slot=${_clusterctl_slots[$cmd|$w]-%(nothing)s}
    elif [[ -z $ended && $cur == -* ]]; then
        COMPREPLY=($(compgen -W "${_clusterctl_opts[$cmd]}" -- "$cur")); return
    elif (( npos == 0 )) && [[ -n ${_clusterctl_subs[$cmd]} ]]; then
        COMPREPLY=($(compgen -W "${_clusterctl_subs[$cmd]}" -- "$cur")); return
    else
        slot=${_clusterctl_slots[$cmd|$((npos + 1))]-}
        [[ -n $slot ]] || slot=${_clusterctl_slots[$cmd|%(repeated)s]-%(nothing)s}
    fi
    case $slot in
        %(clusters)s) COMPREPLY=($(compgen -W "$(%(names)s)" -- "$cur")) ;;
        %(files)s) COMPREPLY=($(compgen -f -- "$cur")); compopt -o filenames 2>/dev/null ;;
        %(nothing)s) ;;
        *) COMPREPLY=($(compgen -W "$slot" -- "$cur")) ;;
    esac
}
complete -F _clusterctl clusterctl
"""

ZSH = r"""#compdef clusterctl
# zsh completion for clusterctl, made by `clusterctl completion zsh` from its parser.
# Use (after compinit): source <(clusterctl completion zsh)
%(tables)s

_clusterctl() {
    local cur=${words[CURRENT]} cmd=clusterctl w slot value= ended=
    local -i i=2 npos=0
    local -a entries
    while (( i < CURRENT )); do
        w=${words[i]}; i+=1
        if [[ -n $value ]]; then value=; continue; fi
        if [[ -z $ended && $w == -- ]]; then ended=1; continue; fi
        if [[ -z $ended && $w == -* ]]; then
            [[ $w != *=* && " ${_clusterctl_valued[$cmd]} " == *" $w "* ]] && value=1
            continue
        fi
        if (( npos == 0 )) && [[ -n ${(M)${(f)_clusterctl_subs[$cmd]}:#$w:*} ]]; then
            cmd="$cmd $w"; continue
        fi
        npos+=1
    done
    if [[ -n $value ]]; then
        slot=${_clusterctl_slots[$cmd|${words[CURRENT-1]}]-%(nothing)s}
    elif [[ -z $ended && $cur == -* ]]; then
        entries=(${(f)_clusterctl_opts[$cmd]})
        _describe -t options option entries; return
    elif (( npos == 0 )) && [[ -n ${_clusterctl_subs[$cmd]} ]]; then
        entries=(${(f)_clusterctl_subs[$cmd]})
        _describe -t commands command entries; return
    else
        slot=${_clusterctl_slots[$cmd|$((npos + 1))]-}
        [[ -n $slot ]] || slot=${_clusterctl_slots[$cmd|%(repeated)s]-%(nothing)s}
    fi
    case $slot in
        %(clusters)s) compadd -- ${(f)"$(%(names)s)"} ;;
        %(files)s) _files ;;
        %(nothing)s) ;;
        *) compadd -- ${=slot} ;;
    esac
}
if (( $+functions[compdef] )); then compdef _clusterctl clusterctl; fi
"""

FISH = r"""# fish completion for clusterctl, made by `clusterctl completion fish` from its parser.
# Use: clusterctl completion fish > ~/.config/fish/completions/clusterctl.fish
function __clusterctl_table --argument-names table key
    switch "$table $key"
%(cases)s
    end
end

function __clusterctl_complete
    set -l words (commandline -opc)
    set -l cur (commandline -ct)
    set -l cmd clusterctl
    set -l npos 0
    set -l value
    set -l ended
    for w in $words[2..-1]
        if test -n "$value"; set value; continue; end
        if test -z "$ended" -a "$w" = --; set ended 1; continue; end
        if test -z "$ended"; and string match -q -- '-*' $w
            if not string match -q -- '*=*' $w; and contains -- $w (__clusterctl_table valued $cmd)
                set value 1
            end
            continue
        end
        set -l names (__clusterctl_table subs $cmd | string replace -r '\t.*' '')
        if test $npos -eq 0; and contains -- $w $names
            set cmd "$cmd $w"; continue
        end
        set npos (math $npos + 1)
    end
    set -l slot
    set -l subs (__clusterctl_table subs $cmd)
    if test -n "$value"
        set slot (__clusterctl_table slots "$cmd|$words[-1]")
    else if test -z "$ended"; and string match -q -- '-*' $cur
        __clusterctl_table opts $cmd; return
    else if test $npos -eq 0 -a -n "$subs"
        printf '%%s\n' $subs; return
    else
        set slot (__clusterctl_table slots "$cmd|"(math $npos + 1))
        test -n "$slot"; or set slot (__clusterctl_table slots "$cmd|%(repeated)s")
    end
    switch "$slot"
        case %(clusters)s
            %(names)s
        case %(files)s
            __fish_complete_path $cur
        case %(nothing)s ''
        case '*'
            string split ' ' -- $slot
    end
end
complete -c clusterctl -f -a '(__clusterctl_complete)'
"""


def _fields() -> dict[str, str]:
    return {"clusters": CLUSTERS, "files": FILES, "nothing": NOTHING, "repeated": REPEATED,
            "names": NAMES}


def bash(grammar: Grammar) -> str:
    return BASH % {**_fields(), "tables": _assoc(_tables(grammar, described=None),
                                                 "declare -gA")}


def zsh(grammar: Grammar) -> str:
    # _describe's entries are "name:description" (a colon in a name would need a backslash:
    # clusterctl's names have none).
    return ZSH % {**_fields(), "tables": _assoc(_tables(grammar, described=":"),
                                                "typeset -gA")}


def fish(grammar: Grammar) -> str:
    """fish has no maps: the tables are the cases of a `switch`, one per key, each printing
    its entries a line each (multi-valued ones as fish's list of lines). Keys hold no
    wildcard characters (* ? [), which a case would match as patterns."""
    cases = []
    for name, table in _tables(grammar, described="\t").items():
        for key, value in table.items():
            words = value.split("\n") if name in ("subs", "opts") else (
                value.split() if name == "valued" else [value])
            printed = " ".join(_fish(word) for word in words if word)
            cases.append(f"        case {_fish(f'{name} {key}')}\n"
                         f"            printf '%s\\n' {printed}")
    return FISH % {**_fields(), "cases": "\n".join(cases)}


SCRIPTS: dict[str, Callable[[Grammar], str]] = {"bash": bash, "zsh": zsh, "fish": fish}
