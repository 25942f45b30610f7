package idem_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/idemgo/idem"
)

// A constructor that can fail says so with an error naming the field at
// fault, never a panic: one rule for bad input across every package.
func TestNewMemoryStoreRefusesBadOptions(t *testing.T) {
	cases := []struct {
		o     idem.Options
		field string
	}{
		{idem.Options{LeaseTTL: -time.Second}, "LeaseTTL"},
		{idem.Options{Retention: time.Second, LeaseTTL: time.Minute}, "Retention"},
		{idem.Options{MaxKeyBytes: -1}, "MaxKeyBytes"},
		{idem.Options{Worker: "a\x00b"}, "Worker"},
	}
	for _, c := range cases {
		s, err := idem.NewMemoryStore(c.o)
		if err == nil || s != nil {
			t.Errorf("NewMemoryStore(%+v) = %v, %v; want nil and an error naming %s", c.o, s, err, c.field)
			continue
		}
		if !strings.Contains(err.Error(), c.field) {
			t.Errorf("NewMemoryStore(%+v) error %q; want it to name %s", c.o, err, c.field)
		}
		m := memStore(idem.Options{})
		if _, err := m.Share(c.o); err == nil || !strings.Contains(err.Error(), c.field) {
			t.Errorf("Share(%+v) error %v; want one naming %s", c.o, err, c.field)
		}
	}
	if _, err := idem.NewMemoryStoreClock(idem.Options{}, nil); err == nil {
		t.Error("NewMemoryStoreClock(nil clock) = nil error; want one")
	}
}

// A store that no constructor made says which constructor to use, instead
// of judging a key against limits it never resolved.
func TestZeroValueStoreNamesItsConstructor(t *testing.T) {
	ctx := context.Background()
	for name, s := range map[string]idem.Store{"memory": &idem.MemoryStore{}, "redis": &idem.RedisStore{}} {
		_, err := s.Claim(ctx, "k", nil)
		if err == nil || !strings.Contains(err.Error(), "New"+map[string]string{"memory": "MemoryStore", "redis": "RedisStore"}[name]) {
			t.Errorf("%s zero value: Claim error %v; want one naming its constructor", name, err)
		}
		if _, err := s.Lookup(ctx, "k"); err == nil {
			t.Errorf("%s zero value: Lookup error nil; want one", name)
		}
		if err := s.Confirm(ctx, &idem.Lease{Key: "k", Token: 1, Owner: "w"}, nil); err == nil {
			t.Errorf("%s zero value: Confirm error nil; want one", name)
		}
	}
}
