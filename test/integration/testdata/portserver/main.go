// Command portserver is the web server the port-forwarding tests run inside
// a sandbox: a listing at /, request echo, a WebSocket echo, server-sent
// events, a large deterministic download and a hashing upload.
package main

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log"
	"math/rand"
	"net/http"
	"strconv"
	"time"

	"golang.org/x/net/websocket"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:8000", "address")
	flag.Parse()
	mux := http.NewServeMux()
	mux.HandleFunc("/{$}", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(w, "<html><body><h1>portserver listing</h1><a href=\"echo\">echo</a></body></html>")
	})
	mux.HandleFunc("/echo/", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		http.SetCookie(w, &http.Cookie{Name: "app", Value: "1", Domain: "localhost", Path: "/"})
		json.NewEncoder(w).Encode(map[string]any{"path": r.URL.Path, "raw_query": r.URL.RawQuery, "host": r.Host,
			"headers": r.Header, "proto": r.Proto})
	})
	mux.Handle("/ws", websocket.Handler(func(c *websocket.Conn) {
		for {
			var msg string
			if websocket.Message.Receive(c, &msg) != nil || websocket.Message.Send(c, msg) != nil {
				return
			}
		}
	}))
	mux.HandleFunc("/sse", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		for i := 1; i <= 3; i++ {
			fmt.Fprintf(w, "id: %d\ndata: tick %d\n\n", i, i)
			w.(http.Flusher).Flush()
			time.Sleep(400 * time.Millisecond)
		}
	})
	mux.HandleFunc("/blob", func(w http.ResponseWriter, r *http.Request) {
		n, _ := strconv.ParseInt(r.URL.Query().Get("bytes"), 10, 64)
		seed, _ := strconv.ParseInt(r.URL.Query().Get("seed"), 10, 64)
		w.Header().Set("Content-Length", strconv.FormatInt(n, 10))
		io.CopyN(w, rand.New(rand.NewSource(seed)), n)
	})
	mux.HandleFunc("POST /sha256", func(w http.ResponseWriter, r *http.Request) {
		h := sha256.New()
		n, err := io.Copy(h, r.Body)
		if err != nil {
			http.Error(w, err.Error(), 500)
			return
		}
		fmt.Fprintf(w, "%s %d", hex.EncodeToString(h.Sum(nil)), n)
	})
	mux.HandleFunc("/slow", func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(200)
		w.(http.Flusher).Flush()
		<-r.Context().Done()
	})
	log.Fatal(http.ListenAndServe(*listen, mux))
}
