package testenv

import "testing"

func TestServerIdentity(t *testing.T) {
	for _, tc := range []struct {
		name, info, product, version string
	}{
		{"redis 7.0", "# Server\r\nredis_version:7.0.15\r\nredis_git_sha1:00000000\r\nredis_mode:standalone\r\n", "redis", "7.0.15"},
		{"redis 8.0", "# Server\r\nredis_version:8.0.2\r\nredis_mode:standalone\r\n", "redis", "8.0.2"},
		// Valkey reports the Redis version it is compatible with too: its
		// own is valkey_version.
		{"valkey 8.1", "# Server\r\nredis_version:7.2.4\r\nserver_name:valkey\r\nvalkey_version:8.1.1\r\n", "valkey", "8.1.1"},
		{"no version", "# Server\r\nredis_mode:standalone\r\n", "redis", ""},
	} {
		product, version := serverIdentity(tc.info)
		if product != tc.product || version != tc.version {
			t.Errorf("%s: serverIdentity = %q, %q; want %q, %q", tc.name, product, version, tc.product, tc.version)
		}
	}
}
