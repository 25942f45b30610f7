package main

import (
	"strings"
	"testing"
)

// The fixture's three files and their calls are known: the walk must print
// exactly this tree and these figures. ignored.go, excluded by its build
// constraint, would declare check twice.
func TestRun(t *testing.T) {
	for _, tc := range []struct{ key, want string }{
		{"", `(*T).Start  a.go:11
  (*T).done  a.go:21
  prefix  b.go:3
    check  c.go:3
  (*T).store  b.go:5
    (*T).count  c.go:5
    f (func value)  b.go:8
    (*T).count (seen)  c.go:5
  d.Do (interface)  a.go:15
  (*T).done (seen)  a.go:21
  (*T).count (seen)  c.go:5
  skip  c.go:8

path: a.go > b.go > c.go > b.go > a.go > b.go > c.go > b.go > a.go > c.go > a.go
files: 3
climbs back: 8
`},
		// done is called on a receiver that does not carry the key, and
		// skip gets the key but does not use it.
		{"key", `(*T).Start  a.go:11
  prefix  b.go:3
    check  c.go:3
  (*T).store  b.go:5
    (*T).count  c.go:5
    f (func value)  b.go:8
    (*T).count (seen)  c.go:5
  d.Do (interface)  a.go:15
  (*T).count (seen)  c.go:5

path: a.go > b.go > c.go > b.go > a.go > b.go > c.go > b.go > a.go
files: 3
climbs back: 6
`},
	} {
		var out strings.Builder
		if err := run(&out, "testdata/fixture", "(*T).Start", tc.key); err != nil {
			t.Fatalf("run(-key %q) = %v", tc.key, err)
		}
		if got := out.String(); got != tc.want {
			t.Errorf("run(-key %q) printed\n%s\nwant\n%s", tc.key, got, tc.want)
		}
	}
}

func TestRunUnknown(t *testing.T) {
	var out strings.Builder
	if err := run(&out, "testdata/fixture", "(*T).Stop", ""); err == nil {
		t.Errorf("run((*T).Stop) = nil; want an error: the fixture declares no Stop")
	}
	if err := run(&out, "testdata/fixture", "(*T).Start", "id"); err == nil {
		t.Errorf("run((*T).Start, -key id) = nil; want an error: Start has no parameter id")
	}
}
