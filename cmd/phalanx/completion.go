package main

import (
	"fmt"
	"io"
)

// completionBash completes phalanx's commands, subcommands and flags in
// bash. The flags are read at completion time from the command's own help
// (every help lists them as "  --name"), so the script never goes stale.
const completionBash = `# phalanx completion for bash: source <(phalanx completion bash)
_phalanx() {
  local cur=${COMP_WORDS[COMP_CWORD]} cmd=${COMP_WORDS[1]} sub=""
  case "$cmd" in
    bench|ckpt|chaos) sub=${COMP_WORDS[2]} ;;
  esac
  if [ "$COMP_CWORD" -eq 1 ]; then
    COMPREPLY=($(compgen -W "train worker coordinator ps stop etcd bench ckpt chaos version help completion" -- "$cur"))
    return
  fi
  if [ "$COMP_CWORD" -eq 2 ]; then
    case "$cmd" in
      bench) COMPREPLY=($(compgen -W "allreduce tcp checkpoint ps" -- "$cur")); return ;;
      ckpt) COMPREPLY=($(compgen -W "ls inspect verify rm" -- "$cur")); return ;;
      chaos) COMPREPLY=($(compgen -W "run list soak" -- "$cur")); return ;;
      help) COMPREPLY=($(compgen -W "train worker coordinator ps stop etcd bench ckpt chaos" -- "$cur")); return ;;
      completion) COMPREPLY=($(compgen -W "bash zsh" -- "$cur")); return ;;
    esac
  fi
  if [[ "$cur" == -* ]]; then
    local flags
    flags=$("${COMP_WORDS[0]}" $cmd $sub --help 2>/dev/null | grep -o '^  --[a-z0-9-]*' | tr -d ' ')
    COMPREPLY=($(compgen -W "$flags" -- "$cur"))
    return
  fi
  COMPREPLY=($(compgen -f -- "$cur"))
}
complete -o default -F _phalanx phalanx
`

// runCompletion is "phalanx completion bash|zsh": the completion script on
// stdout.
func runCompletion(args []string, stdout io.Writer) error {
	if len(args) != 1 {
		return usagef("completion: name the shell: bash or zsh (source <(phalanx completion bash))")
	}
	switch args[0] {
	case "bash":
		fmt.Fprint(stdout, completionBash)
	case "zsh":
		fmt.Fprint(stdout, "# phalanx completion for zsh: source <(phalanx completion zsh)\nautoload -U +X bashcompinit && bashcompinit\n"+completionBash)
	default:
		return usagef("completion: unknown shell %q (want bash or zsh)", args[0])
	}
	return nil
}
