package main

import (
	"encoding/json"
	"fmt"
	"text/tabwriter"

	"github.com/space-sandbox/space/pkg/client"
)

// The client verbs of `space node`: the registry and drains, over the
// control API with an admin key. `space node` with flags runs a node.

const nodeVerbsUsage = `usage: space node <verb> [flags]   (space node --name N … runs a node)

verbs:
  list                 the cluster's nodes and server replicas, with their state and whether drained
  drain NAME [--wait=true]  stop placing on NAME and move its sandboxes to other nodes
                       (hibernate there, resume elsewhere: same ids and session tokens)
  undrain NAME         placement on NAME resumes

every verb takes --url, --api-key (an admin key) and --json`

// nodeVerb runs a client verb of `space node`; ok is false when args do
// not name one (they are a node's flags).
func nodeVerb(args []string) (ok bool, err error) {
	if len(args) == 0 {
		return false, nil
	}
	switch args[0] {
	case "list", "ls":
		return true, nodeList(args[1:])
	case "drain":
		return true, nodeDrain(args[1:])
	case "undrain":
		return true, nodeUndrain(args[1:])
	case "help":
		fmt.Println(nodeVerbsUsage)
		return true, nil
	}
	return false, nil
}

func nodeList(args []string) error {
	fs, cl := newClientFlags("node list")
	pos, err := parseClientArgs(fs, args)
	if err != nil {
		return err
	}
	if err := wantArgs(fs, pos, 0, ""); err != nil {
		return err
	}
	c, ctx, stop, err := cl.connect()
	if err != nil {
		return err
	}
	defer stop()
	nodes, err := c.ListNodes(ctx)
	if err != nil {
		return err
	}
	if cl.json {
		return cl.printJSON(nodes)
	}
	tw := tabwriter.NewWriter(cl.out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tKIND\tSTATE\tDRAINED\tDRIVER\tSANDBOXES\tSNAPSHOT STORE\tHEARTBEAT")
	for _, n := range nodes {
		drained := ""
		if n.Drained {
			drained = "drained"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s\n", n.Name, n.Kind, n.State, drained, n.Driver, n.Sandboxes, n.SnapshotStore, humanAge(n.HeartbeatAt))
	}
	return tw.Flush()
}

func nodeDrain(args []string) error {
	fs, cl := newClientFlags("node drain")
	wait := fs.Bool("wait", true, "wait until every sandbox has moved (or stayed, with the reason)")
	idem := fs.String("idempotency-key", "", "makes retrying this exact request safe")
	pos, err := parseClientArgs(fs, args)
	if err != nil {
		return err
	}
	if err := wantArgs(fs, pos, 1, "NAME [--wait=false]"); err != nil {
		return err
	}
	c, ctx, stop, err := cl.connect()
	if err != nil {
		return err
	}
	defer stop()
	op, err := c.DrainNode(ctx, pos[0], *idem)
	if err != nil {
		return err
	}
	if !*wait {
		if cl.json {
			return cl.printJSON(op)
		}
		fmt.Fprintf(cl.out, "node %s drained; moving its sandboxes (operation %s)\n", pos[0], op.ID)
		return nil
	}
	if op, err = newProgressPrinter().watch(ctx, c, op.ID); err != nil {
		return err
	}
	if cl.json {
		return cl.printJSON(op)
	}
	return printDrain(cl, op)
}

func printDrain(cl *clientCLI, op client.Operation) error {
	var res client.DrainResult
	if err := json.Unmarshal(op.Result, &res); err != nil {
		return fmt.Errorf("drain result: %w", err)
	}
	fmt.Fprintf(cl.out, "node %s drained: %d sandboxes moved, %d stayed, %d hibernated (they wake elsewhere)\n",
		res.Node, len(res.Moved), len(res.Stayed), res.Hibernated)
	for _, m := range res.Moved {
		fmt.Fprintf(cl.out, "  moved  %s → %s\n", m.Sandbox, m.To)
	}
	for _, s := range res.Stayed {
		fmt.Fprintf(cl.out, "  stayed %s (%s): %s\n", s.Sandbox, s.State, s.Reason)
	}
	return nil
}

func nodeUndrain(args []string) error {
	fs, cl := newClientFlags("node undrain")
	pos, err := parseClientArgs(fs, args)
	if err != nil {
		return err
	}
	if err := wantArgs(fs, pos, 1, "NAME"); err != nil {
		return err
	}
	c, ctx, stop, err := cl.connect()
	if err != nil {
		return err
	}
	defer stop()
	n, err := c.UndrainNode(ctx, pos[0])
	if err != nil {
		return err
	}
	if cl.json {
		return cl.printJSON(n)
	}
	fmt.Fprintf(cl.out, "node %s undrained: placement resumes\n", n.Name)
	return nil
}
