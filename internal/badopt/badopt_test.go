package badopt

import (
	"net/http"
	"testing"
	"time"
)

func TestMessages(t *testing.T) {
	var nilTransport *http.Transport
	for _, tc := range []struct {
		err  error
		want string
	}{
		{Default("idem", "LeaseTTL", -time.Second, 30*time.Second, "is negative"),
			"idem: LeaseTTL: -1s is negative; 0 means the default, 30s"},
		{Error("idem", "Retention", 10*time.Millisecond, "is shorter than LeaseTTL %v", 30*time.Second),
			"idem: Retention: 10ms is shorter than LeaseTTL 30s"},
		{Error("redisstream", "Stream", "", "is empty; set the stream to read"),
			`redisstream: Stream: "" is empty; set the stream to read`},
		{Default("idem", "DoOptions.MaxHold", -1, "no cap", "is negative"),
			"idem: DoOptions.MaxHold: -1 is negative; 0 means the default, no cap"},
		{Error("client", "Base", nilTransport, "is nil"), "client: Base: (*http.Transport)(nil) is nil"},
		{Error("middleware", "Tx", &http.Transport{}, "is set"), "middleware: Tx: *http.Transport is set"},
		{Error("middleware", "Scope", nil, "is unset"), "middleware: Scope: nil is unset"},
		{Error("x", "Topics", []string{}, "is empty"), "x: Topics: [] is empty"},
		{Error("x", "Rule", 1, "has %d%% of %s", 100, "it"), "x: Rule: 1 has 100% of it"},
	} {
		if got := tc.err.Error(); got != tc.want {
			t.Errorf("message %q; want %q", got, tc.want)
		}
	}
}
