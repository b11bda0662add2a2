package server

import (
	"context"
	"net/http"
	"time"

	"github.com/space-sandbox/space/internal/cluster"
	"github.com/space-sandbox/space/internal/console"
)

// withConsole serves the web console (/ui/, and / redirects there) on the
// control listener in front of the APIs; its pages may connect to this
// origin and to the data planes named by dataURLs.
func withConsole(h http.Handler, dataURLs func() []string) http.Handler {
	return console.New(console.Options{DataURLs: dataURLs}).Wrap(h)
}

// nodeDataURLs are the data planes of a --remote-nodes server: every
// registered node's.
func nodeDataURLs(r *cluster.Remote) func() []string {
	return func() []string {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		nodes, err := r.Nodes(ctx)
		if err != nil {
			return nil
		}
		var out []string
		for _, n := range nodes {
			if n.DataURL != "" {
				out = append(out, n.DataURL)
			}
		}
		return out
	}
}
