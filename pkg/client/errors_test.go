package client

import (
	"errors"
	"fmt"
	"testing"
)

func TestAPIErrorIs(t *testing.T) {
	for _, c := range []struct {
		err  *APIError
		want []error
		not  []error
	}{
		{&APIError{404, "not_found", "x"}, []error{ErrNotFound}, []error{ErrConflict}},
		{&APIError{409, "sandbox_paused", "x"}, []error{ErrSandboxPaused, ErrConflict}, []error{ErrNotFound}},
		{&APIError{409, "no_stdin", "x"}, []error{ErrConflict}, []error{ErrSandboxPaused}},
		{&APIError{401, "token_expired", "x"}, []error{ErrTokenExpired, ErrUnauthorized}, nil},
		{&APIError{400, "unknown_field", "x"}, []error{ErrInvalidArgument}, nil},
		{&APIError{503, "http_503", "proxy page"}, []error{ErrUnavailable}, nil},
		{&APIError{418, "teapot", "x"}, nil, []error{ErrNotFound, ErrInternal}},
	} {
		wrapped := fmt.Errorf("call: %w", c.err)
		for _, w := range c.want {
			if !errors.Is(wrapped, w) {
				t.Errorf("%v is not %v", c.err, w)
			}
		}
		for _, n := range c.not {
			if errors.Is(wrapped, n) {
				t.Errorf("%v is %v", c.err, n)
			}
		}
	}
}
