// Command mnfetch is the HTTP client test/multinode copies into its
// sandboxes (the template's busybox wget cannot resolve names): it GETs
// one URL, prints the body and exits 0, or prints the error and exits 1.
package main

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"time"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: mnfetch URL")
		os.Exit(2)
	}
	c := &http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get(os.Args[1])
	if err != nil {
		fmt.Println("error:", err)
		os.Exit(1)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
	if resp.StatusCode != http.StatusOK {
		fmt.Printf("status %d: %s", resp.StatusCode, body)
		os.Exit(1)
	}
	os.Stdout.Write(body)
}
