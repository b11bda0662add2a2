package main

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/space-sandbox/space/pkg/client"
)

// clientFlags are the flags every client verb takes.
var clientFlags = []string{"--url", "--api-key", "--json"}

// completionVerb is one completable command line: its flags (client flags
// added for client verbs) and what its positional arguments are.
type completionVerb struct {
	flags  []string
	client bool
	ids    string // "sandboxes" or "snapshots": complete these ids
	words  []string
}

// completionTable maps "cmd" and "cmd verb" to what follows them. The
// CLI tests check it against each verb's -h output.
var completionTable = map[string]completionVerb{
	"sandbox create": {client: true, flags: []string{"--template", "--env", "--metadata", "--memory", "--cpus", "--pids", "--disk", "--timeout",
		"--on-timeout", "--auto-pause", "--auto-resume", "--network", "--allow", "--preset", "--public-ports", "--wait", "--idempotency-key"}},
	"sandbox list":      {client: true, flags: []string{"--state", "--metadata", "--limit", "--all-projects"}},
	"sandbox get":       {client: true, ids: "sandboxes"},
	"sandbox exec":      {client: true, ids: "sandboxes", flags: []string{"--shell", "--env", "--cwd", "--user", "--tty", "-t", "--stdin", "-i", "--timeout", "--tag"}},
	"sandbox run-code":  {client: true, ids: "sandboxes", flags: []string{"--language", "--context", "--env", "--timeout", "--save-images"}},
	"sandbox logs":      {client: true, ids: "sandboxes", flags: []string{"--command", "--all", "--after"}},
	"sandbox cp":        {client: true, ids: "sandboxes", flags: []string{"--mode", "--user", "--progress"}},
	"sandbox timeout":   {client: true, ids: "sandboxes"},
	"sandbox session":   {client: true, ids: "sandboxes"},
	"sandbox network":   {client: true, ids: "sandboxes", flags: []string{"--network", "--allow", "--preset"}},
	"sandbox netlog":    {client: true, ids: "sandboxes", flags: []string{"--after", "--limit"}},
	"sandbox metrics":   {client: true, ids: "sandboxes", flags: []string{"--since"}},
	"sandbox ports":     {client: true, ids: "sandboxes", flags: []string{"--wait", "--timeout"}},
	"sandbox url":       {client: true, ids: "sandboxes", flags: []string{"--signed", "--ttl", "--path"}},
	"sandbox pause":     {client: true, ids: "sandboxes", flags: []string{"--wait", "--idempotency-key"}},
	"sandbox resume":    {client: true, ids: "sandboxes", flags: []string{"--wait", "--idempotency-key"}},
	"sandbox hibernate": {client: true, ids: "sandboxes", flags: []string{"--wait", "--idempotency-key"}},
	"sandbox rm":        {client: true, ids: "sandboxes", flags: []string{"--wait", "--all"}},
	"snapshot create":   {client: true, ids: "sandboxes", flags: []string{"--wait", "--idempotency-key"}},
	"snapshot list":     {client: true, flags: []string{"--sandbox"}},
	"snapshot get":      {client: true, ids: "snapshots"},
	"snapshot rm":       {client: true, ids: "snapshots", flags: []string{"--wait"}},
	"snapshot fork":     {client: true, ids: "snapshots", flags: []string{"--count", "--wait", "--idempotency-key"}},
	"template list":     {client: true},
	"template get":      {client: true, ids: "templates"},
	"template delete":   {client: true, ids: "templates"},
	"template tag":      {client: true, ids: "templates"},
	"template logs":     {client: true, flags: []string{"--step"}},
	"template gc":       {client: true},
	"template build": {client: true, flags: []string{"--source", "--packages", "--env", "--cwd", "--user", "--wait", "--idempotency-key",
		"--dir", "--tar", "--image", "--archive", "--data-dir", "--uid-base", "-f", "--file", "-t", "--tag", "--no-context", "--logs", "--public"}},
	"ops get":            {client: true, flags: []string{"--wait"}},
	"node list":          {client: true},
	"node drain":         {client: true, flags: []string{"--wait", "--idempotency-key"}},
	"node undrain":       {client: true},
	"ops watch":          {client: true},
	"events":             {client: true, flags: []string{"--after", "--sandbox"}},
	"logs":               {client: true, ids: "sandboxes", flags: []string{"--command", "--all", "--after"}},
	"keys create":        {flags: []string{"--data-dir", "--store", "--project", "--name", "--admin", "--init", "--json"}},
	"keys list":          {flags: []string{"--data-dir", "--store", "--project", "--name", "--admin", "--init", "--json"}},
	"keys revoke":        {flags: []string{"--data-dir", "--store", "--project", "--name", "--admin", "--init", "--json"}},
	"certs init":         {flags: []string{"--dir", "--days"}},
	"certs issue":        {flags: []string{"--ca-dir", "--out", "--node", "--server", "--host", "--days"}},
	"credentials rewrap": {flags: []string{"--store", "--credential-keys"}},
	"server":             {flags: []string{"--data-dir", "--store", "--listen", "--data-listen", "--data-url", "--driver", "--namespace-criu", "--namespace-lazy-restore", "--cgroup-parent", "--cgroup-favordynmods", "--builtins", "--template-dir", "--run-dir", "--default-timeout", "--session-ttl", "--warm-templates", "--warm-pool", "--egress", "--allow-private-registries", "--template-ready-timeout", "--snapshot-store", "--audit-log", "--metrics-listen", "--retention", "--log-format", "--log-level", "--sandbox-domain", "--max-port-connections", "--uid-pool", "--uid-pool-dir", "--e2b-network", "--data-tls-cert", "--data-tls-key"}},
	"node": {flags: []string{"--name", "--store", "--data-dir", "--template-dir", "--run-dir", "--addr-file", "--listen", "--rpc-url", "--data-listen", "--data-url", "--namespace-criu", "--namespace-lazy-restore", "--cgroup-parent", "--cgroup-favordynmods",
		"--driver", "--warm-templates", "--warm-pool", "--builtins", "--uid-base", "--uid-pool", "--uid-pool-dir", "--cluster-secret-file", "--cluster-tls-dir", "--cluster-cert", "--cluster-key", "--cluster-ca", "--cluster-plaintext", "--heartbeat", "--cpus", "--memory-bytes", "--max-sandboxes", "--snapshot-store", "--metrics-listen", "--log-format", "--log-level", "--sandbox-domain", "--max-port-connections"},
		words: []string{"list", "drain", "undrain", "help"}},
	"completion": {words: []string{"bash", "zsh", "fish"}},
	"sandbox": {words: []string{"create", "list", "get", "exec", "logs", "cp", "ports", "url", "pause", "resume", "hibernate", "rm",
		"timeout", "session", "network", "netlog", "metrics", "help"}},
	"snapshot":    {words: []string{"create", "list", "get", "rm", "fork", "help"}},
	"template":    {words: []string{"list", "get", "build", "tag", "delete", "logs", "gc", "help"}},
	"ops":         {words: []string{"get", "watch", "help"}},
	"keys":        {words: []string{"create", "list", "revoke", "help"}},
	"certs":       {words: []string{"init", "issue"}},
	"credentials": {words: []string{"rewrap"}},
	"bench":       {flags: []string{"--json", "--out", "--driver", "--cgroup-favordynmods", "--drivers", "--port-requests", "--port-clients", "--mem-snapshot-runs", "--mem-dirty-mb", "--mem-forks", "--fleet", "--fleet-clients", "--fleet-nodes", "--fleet-replicas", "--fleet-cycles", "--fleet-rounds", "--fleet-profile", "--fleet-bin"}},
	"doctor":      {flags: []string{"--data-dir", "--runsc", "--criu", "--json"}},
	"operator":    {client: true, flags: []string{"--kubeconfig", "--api-key-file", "--namespace", "--workers", "--claim-workers", "--resync", "--leader-elect", "--leader-election-namespace", "--leader-lease-duration", "--leader-renew-period", "--webhook-listen", "--webhook-cert-dir", "--log-format", "--log-level"}},
	"version":     {client: true, flags: []string{"--server"}},
	"health":      {client: true, flags: []string{"--timeout"}},
	"agent":       {},
	"help":        {},
}

// flagValues are what the shells complete after a flag, whatever the
// verb: fixed words, or "@templates" for the server's template names.
var flagValues = map[string]string{
	"--template":   "@templates",
	"--sandbox":    "@sandboxes",
	"--network":    "blocked allowlist open",
	"--on-timeout": "delete hibernate",
	"--preset":     "debian pypi npm goproxy",
	"--source":     "busybox debian",
	"--state":      "creating running paused hibernated deleting deleted failed lost",
}

func (v completionVerb) allFlags() []string {
	if v.client {
		return append(append([]string{}, v.flags...), clientFlags...)
	}
	return v.flags
}

const completionUsage = "usage: space completion bash|zsh|fish\n\n" +
	"  bash: source <(space completion bash)       (or save it in /etc/bash_completion.d/space)\n" +
	"  zsh:  source <(space completion zsh)        (or save it as _space on your $fpath)\n" +
	"  fish: space completion fish > ~/.config/fish/completions/space.fish"

func runCompletion(args []string) error {
	if len(args) == 2 && args[0] == "__ids" {
		return completeIDs(args[1])
	}
	if len(args) != 1 {
		return usagef("%s", completionUsage)
	}
	switch args[0] {
	case "bash":
		fmt.Print(bashCompletion())
	case "zsh":
		fmt.Print("#compdef space\n# zsh completion for space, through bash's completion function.\n" +
			"autoload -U +X compinit && compinit\nautoload -U +X bashcompinit && bashcompinit\n" + bashCompletion())
	case "fish":
		fmt.Print(fishCompletion())
	case "-h", "--help", "help":
		fmt.Println(completionUsage)
	default:
		return usagef("unknown shell %q\n%s", args[0], completionUsage)
	}
	return nil
}

// completeIDs prints sandbox or snapshot ids, one a line, for the shell
// scripts; it prints nothing on any error (no key, no server).
func completeIDs(kind string) error {
	fs, cl := newClientFlags("completion")
	fs.Parse(nil)
	c, err := cl.client()
	if err != nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	switch kind {
	case "sandboxes":
		for sb, err := range c.AllSandboxes(ctx, client.ListOptions{State: []string{"creating", "running", "paused", "hibernated"}}) {
			if err != nil {
				return nil
			}
			fmt.Println(sb.ID)
		}
	case "snapshots":
		list, _ := c.ListSnapshots(ctx, "")
		for _, s := range list {
			fmt.Println(s.ID)
		}
	case "templates":
		list, _ := c.ListTemplates(ctx)
		for _, t := range list {
			fmt.Println(t.Name)
		}
	}
	return nil
}

// topCommands are the first words, from main's table.
func topCommands() []string {
	var out []string
	for _, c := range commands() {
		out = append(out, c.name)
	}
	return out
}

func sortedFlagValues() []string {
	out := make([]string, 0, len(flagValues))
	for f := range flagValues {
		out = append(out, f)
	}
	sort.Strings(out)
	return out
}

func sortedKeys() []string {
	keys := make([]string, 0, len(completionTable))
	for k := range completionTable {
		if true {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	return keys
}

func bashCompletion() string {
	var b strings.Builder
	b.WriteString(`# bash completion for space; load it with: source <(space completion bash)
_space_complete() {
  local cur="${COMP_WORDS[COMP_CWORD]}" key="" words="" ids="" i
  # The command line so far: "cmd" or "cmd verb" (flags and values skipped).
  local -a pos=()
  for ((i = 1; i < COMP_CWORD; i++)); do
    case "${COMP_WORDS[i]}" in
      --) break ;;
      -*) ;;
      *) pos+=("${COMP_WORDS[i]}") ;;
    esac
  done
  if ((${#pos[@]} == 0)); then
    COMPREPLY=($(compgen -W "` + strings.Join(append(topCommands(), "help"), " ") + `" -- "$cur"))
    return
  fi
  key="${pos[0]}"
  case "${COMP_WORDS[COMP_CWORD-1]}" in
`)
	for _, f := range sortedFlagValues() {
		v := flagValues[f]
		if kind, ok := strings.CutPrefix(v, "@"); ok {
			fmt.Fprintf(&b, "    %s) COMPREPLY=($(compgen -W \"$(space completion __ids %s 2>/dev/null)\" -- \"$cur\")); return ;;\n", f, kind)
		} else {
			fmt.Fprintf(&b, "    %s) COMPREPLY=($(compgen -W %q -- \"$cur\")); return ;;\n", f, v)
		}
	}
	b.WriteString(`  esac
  case "${pos[0]} ${pos[1]:-}" in
`)
	for _, k := range sortedKeys() {
		if strings.Contains(k, " ") {
			fmt.Fprintf(&b, "    %q) key=%q ;;\n", k, k)
		}
	}
	b.WriteString("  esac\n  case \"$key\" in\n")
	for _, k := range sortedKeys() {
		v := completionTable[k]
		fmt.Fprintf(&b, "    %q) words=%q; ids=%q", k, strings.Join(v.allFlags(), " "), v.ids)
		if len(v.words) > 0 {
			fmt.Fprintf(&b, "; [[ $cur != -* && ${#pos[@]} -eq 1 ]] && words=%q", strings.Join(v.words, " "))
		}
		b.WriteString(" ;;\n")
	}
	b.WriteString(`  esac
  if [[ $cur != -* && -n $ids ]]; then
    words="$words $(space completion __ids "$ids" 2>/dev/null)"
  fi
  COMPREPLY=($(compgen -W "$words" -- "$cur"))
}
complete -o default -F _space_complete space
`)
	return b.String()
}

func fishCompletion() string {
	var b strings.Builder
	b.WriteString("# fish completion for space: space completion fish > ~/.config/fish/completions/space.fish\n")
	b.WriteString("complete -c space -f\n")
	for _, c := range commands() {
		fmt.Fprintf(&b, "complete -c space -n __fish_use_subcommand -a %s -d %q\n", c.name, c.usage)
	}
	for _, k := range sortedKeys() {
		v := completionTable[k]
		parts := strings.Fields(k)
		cond := "__fish_seen_subcommand_from " + parts[0]
		if len(parts) == 2 {
			cond += "; and __fish_seen_subcommand_from " + parts[1]
		}
		if len(v.words) > 0 {
			fmt.Fprintf(&b, "complete -c space -n '__fish_seen_subcommand_from %s; and not __fish_seen_subcommand_from %s' -a '%s'\n",
				parts[0], strings.Join(v.words, " "), strings.Join(v.words, " "))
		}
		for _, f := range v.allFlags() {
			if strings.HasPrefix(f, "--") {
				fmt.Fprintf(&b, "complete -c space -n '%s' -l %s\n", cond, strings.TrimPrefix(f, "--"))
			} else {
				fmt.Fprintf(&b, "complete -c space -n '%s' -s %s\n", cond, strings.TrimPrefix(f, "-"))
			}
		}
		if v.ids != "" {
			fmt.Fprintf(&b, "complete -c space -n '%s' -a '(space completion __ids %s 2>/dev/null)'\n", cond, v.ids)
		}
	}
	for _, f := range sortedFlagValues() {
		v := flagValues[f]
		if kind, ok := strings.CutPrefix(v, "@"); ok {
			v = "(space completion __ids " + kind + " 2>/dev/null)"
		}
		fmt.Fprintf(&b, "complete -c space -l %s -xa '%s'\n", strings.TrimPrefix(f, "--"), v)
	}
	return b.String()
}
