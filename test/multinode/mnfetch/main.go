// Command mnfetch is the HTTP client test/multinode copies into its
// sandboxes (the template's busybox wget cannot resolve names): it GETs
// one URL, prints the body and exits 0, or prints the error and exits 1.
// With a header ("mnfetch URL 'Name: value'") it sends it and first prints
// the header as this sandbox sent it ("sent Name: value").
package main

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"time"
)

func main() {
	if len(os.Args) != 2 && len(os.Args) != 3 {
		fmt.Fprintln(os.Stderr, "usage: mnfetch URL ['Name: value']")
		os.Exit(2)
	}
	c := &http.Client{Timeout: 5 * time.Second}
	req, err := http.NewRequest("GET", os.Args[1], nil)
	if err != nil {
		fmt.Println("error:", err)
		os.Exit(1)
	}
	if len(os.Args) == 3 {
		name, val, _ := strings.Cut(os.Args[2], ": ")
		req.Header.Set(name, val)
		fmt.Printf("sent %s: %s\n", name, val)
	}
	resp, err := c.Do(req)
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
