package testenv

import (
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"time"
)

// ServeAuthEcho serves HTTPS on ln with cert: an upstream behind an egress
// gateway that injects credentials. Every request's Authorization header
// goes to seen ("" for none); the answer is "auth-ok PATH" when it equals
// want, else "auth-missing PATH". Close the server when done.
func ServeAuthEcho(ln net.Listener, cert tls.Certificate, want string, seen func(auth string)) *http.Server {
	srv := &http.Server{Handler: http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		got := r.Header.Get("Authorization")
		seen(got)
		if got == want {
			fmt.Fprintf(rw, "auth-ok %s\n", r.URL.Path)
			return
		}
		fmt.Fprintf(rw, "auth-missing %s\n", r.URL.Path)
	}), ReadHeaderTimeout: 5 * time.Second, TLSConfig: &tls.Config{Certificates: []tls.Certificate{cert}}}
	go srv.ServeTLS(ln, "", "")
	return srv
}
