package dataplane

import "net/http"

// CORS for browsers. The data plane is another origin than the pages that
// call it (the web console on the control listener, a browser SDK's app),
// and every call has an Authorization or X-Access-Token header, so a
// browser asks first (a preflight OPTIONS) and reads an answer only if it
// names the origin. The data plane takes no ambient credentials, only
// that explicit token, which a page must hold to call it at all, so any
// origin may call: Access-Control-Allow-Origin: *, never with credentials
// (no cookies are read or set here).
const (
	corsMethods = "GET, POST, PUT, DELETE"
	corsHeaders = "Authorization, X-Access-Token, Content-Type, Accept, Last-Event-ID, X-Request-Id"
	corsExpose  = "X-Request-Id, Content-Length"
	corsMaxAge  = "600"
)

// cors answers preflights and marks every answer to a cross-origin request
// readable; requests without an Origin header pass untouched.
func cors(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Origin") == "" {
			next.ServeHTTP(w, r)
			return
		}
		h := w.Header()
		h.Set("Access-Control-Allow-Origin", "*")
		if r.Method == http.MethodOptions && r.Header.Get("Access-Control-Request-Method") != "" {
			h.Set("Access-Control-Allow-Methods", corsMethods)
			h.Set("Access-Control-Allow-Headers", corsHeaders)
			h.Set("Access-Control-Max-Age", corsMaxAge)
			w.WriteHeader(http.StatusNoContent)
			return
		}
		h.Set("Access-Control-Expose-Headers", corsExpose)
		next.ServeHTTP(w, r)
	})
}
