package e2b

import "testing"

// The SDK's getSignature for the same inputs (computed with node:crypto as
// src/sandbox/signature.ts does).
func TestFileSignatureMatchesSDK(t *testing.T) {
	if got := fileSignature("/tmp/a.txt", "read", "user", "sst_tok", "1700000000"); got != "v1_MRdIei3FkPZ3i71Be3Not+dQiRsEfvo7EbOb6iRZjPQ" {
		t.Errorf("with expiration: %s", got)
	}
	if got := fileSignature("x", "write", "", "sst_tok", ""); got != "v1_zPzZuY5RgsYjADqTLQzNsLb7ds0T+oB2UhmwaS71QkI" {
		t.Errorf("without: %s", got)
	}
}
