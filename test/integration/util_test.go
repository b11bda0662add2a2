package integration

import (
	"net/http"
	"strings"
)

func newReq(sb *sandbox, method, path string) (*http.Request, error) {
	req, err := http.NewRequest(method, sb.Data+"/v1/sandboxes/"+sb.ID+path, strings.NewReader(""))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+sb.Token)
	return req, nil
}
