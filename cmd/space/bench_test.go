package main

import (
	"slices"
	"testing"
)

func TestParseClients(t *testing.T) {
	for in, want := range map[string][]int{"1,4,16,32": {1, 4, 16, 32}, " 2 , 8": {2, 8}, "": nil, "0": nil} {
		got, err := parseClients(in)
		if err != nil || !slices.Equal(got, want) {
			t.Errorf("parseClients(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, bad := range []string{"x", "-1", "257", "1,,a"} {
		if _, err := parseClients(bad); err == nil {
			t.Errorf("parseClients(%q) accepted", bad)
		}
	}
	if s := joinInts([]int{1, 4}); s != "1,4" {
		t.Errorf("joinInts: %q", s)
	}
}
