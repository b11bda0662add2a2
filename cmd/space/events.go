package main

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/space-sandbox/space/pkg/client"
)

// runEvents follows the project's lifecycle events, like docker events:
// every operation's progress and every sandbox state change, from the
// retained history (--after) on, until interrupted. The API has no route
// that lists operations; this is how to see them.
func runEvents(args []string) error {
	fs, cl := newClientFlags("events")
	after := fs.Int64("after", 0, "start after this event number (0: the whole retained history)")
	sandbox := fs.String("sandbox", "", "only this sandbox's events")
	if _, err := parseArgsN(fs, args, 0, "[--after N] [--sandbox ID]"); err != nil {
		return err
	}
	c, ctx, stop, err := cl.connect()
	if err != nil {
		return err
	}
	defer stop()
	enc := newJSONLines(cl)
	err = c.WatchEvents(ctx, *after, func(ev client.LifecycleEvent) error {
		if *sandbox != "" && ev.SandboxID != *sandbox {
			return nil
		}
		if cl.json {
			return enc(ev)
		}
		_, err := fmt.Fprintf(cl.out, "%d  %s  %s\n", ev.Seq, ev.CreatedAt.Local().Format(time.TimeOnly), eventLine(ev))
		return err
	})
	if ctx.Err() != nil {
		return nil // interrupted: the normal end
	}
	return err
}

// eventLine is one event in words.
func eventLine(ev client.LifecycleEvent) string {
	switch ev.Type {
	case "operation.updated":
		var op client.Operation
		if json.Unmarshal(ev.Data, &op) == nil && op.ID != "" {
			line := fmt.Sprintf("%s %s %s: %s %d%%", op.ID, op.Kind, op.Target, op.State, op.Progress)
			if op.Error != nil {
				line += " " + op.Error.Code + ": " + op.Error.Message
			} else if op.Message != "" {
				line += " " + op.Message
			}
			return line
		}
	case "sandbox.state":
		var st struct{ ID, State, Reason string }
		if json.Unmarshal(ev.Data, &st) == nil && st.ID != "" {
			line := fmt.Sprintf("%s is %s", st.ID, st.State)
			if st.Reason != "" {
				line += " (" + st.Reason + ")"
			}
			return line
		}
	}
	return ev.Type + " " + string(ev.Data)
}
