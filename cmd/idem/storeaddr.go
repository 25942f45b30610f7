package main

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"
)

// and the value, and list the accepted forms.
func parseRedisAddr(name, v string) (*redis.Options, error) {
	bad := func(why string) error {
		return fmt.Errorf("%s %q: %s; want %s", name, redactPassword(v), why, redisForms)
	}
	scheme, _, isURL := strings.Cut(v, "://")
	if !isURL {
		host, port, err := net.SplitHostPort(v)
		switch {
		case err != nil && !strings.Contains(v, ":"):
			return nil, bad("no port")
		case err != nil:
			return nil, bad("not host:port")
		case host == "":
			return nil, bad("no host")
		}
		if p, err := strconv.Atoi(port); err != nil || p < 1 || p > 65535 {
			return nil, bad(fmt.Sprintf("port %q is not a number from 1 to 65535", port))
		}
		return &redis.Options{Addr: v}, nil
	}
	switch strings.ToLower(scheme) {
	case "redis", "rediss", "unix":
	default:
		return nil, bad(fmt.Sprintf("unknown scheme %q", scheme))
	}
	// go-redis wraps url.Parse, whose errors quote the whole URL again
	// (password included); the reason alone is what the user needs.
	if _, err := url.Parse(v); err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return nil, bad(err.Error())
	}
	o, err := redis.ParseURL(v)
	if err != nil {
		return nil, bad(strings.TrimPrefix(err.Error(), "redis: "))
	}
	return o, nil
}

// redactPassword hides the password of a URL that an error quotes, even
// one that does not parse: errors end up in logs.
func redactPassword(v string) string {
	scheme, rest, ok := strings.Cut(v, "://")
	if !ok {
		return v
	}
	// The userinfo ends at the last '@' before the path.
	auth, path, hasPath := strings.Cut(rest, "/")
	at := strings.LastIndex(auth, "@")
	if at < 0 {
		return v
	}
	user, _, hasPass := strings.Cut(auth[:at], ":")
	if !hasPass {
		return v
	}
	s := scheme + "://" + user + ":xxxxx" + auth[at:]
	if hasPath {
		s += "/" + path
	}
	return s
}

// parseClusterAddrs reads the masters of a Redis Cluster given to the flag
// name: comma-separated addresses, each as parseRedisAddr takes it. A URL's
// user, password and TLS apply to every master, so they must agree.
func parseClusterAddrs(name, v string) (*redis.ClusterOptions, error) {
	co := &redis.ClusterOptions{}
	for i, a := range strings.Split(v, ",") {
		a = strings.TrimSpace(a)
		if a == "" {
			return nil, fmt.Errorf("%s %q: an empty address; want %s", name, v, clusterForms)
		}
		o, err := parseRedisAddr(name, a)
		if err != nil {
			return nil, err
		}
		if o.DB != 0 {
			return nil, fmt.Errorf("%s %q: database %d; a Redis Cluster has only database 0", name, a, o.DB)
		}
		if o.Network == "unix" {
			return nil, fmt.Errorf("%s %q: a Unix socket; want %s", name, a, clusterForms)
		}
		if i == 0 {
			co.Username, co.Password, co.TLSConfig = o.Username, o.Password, o.TLSConfig
		} else if o.Username != co.Username || o.Password != co.Password || (o.TLSConfig == nil) != (co.TLSConfig == nil) {
			return nil, fmt.Errorf("%s %q: its user, password or TLS differ from the first address's; one cluster has one of each", name, a)
		}
		co.Addrs = append(co.Addrs, o.Addr)
	}
	return co, nil
}

// sqliteDSN turns what --sqlite was given into the driver's DSN and the
// file's path. A path is made a file: URI; a file: URI is kept as it is.
// Either way the store's pragmas (WAL, which sqlstore requires, and
// synchronous NORMAL) are added unless the URI sets them itself.
func sqliteDSN(v string) (dsn, path string, err error) {
	bad := func(why string) error {
		return fmt.Errorf("--sqlite %q: %s; want %s", v, why, sqliteForms)
	}
	var query url.Values
	if rest, ok := strings.CutPrefix(v, "file:"); ok {
		p, q, _ := strings.Cut(rest, "?")
		p, _, _ = strings.Cut(p, "#")
		if after, ok := strings.CutPrefix(p, "//"); ok {
			// file://AUTHORITY/path: SQLite takes only an empty authority
			// or localhost.
			auth, abs, _ := strings.Cut(after, "/")
			if auth != "" && auth != "localhost" {
				return "", "", bad(fmt.Sprintf("authority %q; a file: URI names a local file (file:/path or file:///path)", auth))
			}
			p = "/" + abs
		}
		if path, err = url.PathUnescape(p); err != nil {
			return "", "", bad("bad %-escape in the path")
		}
		if query, err = url.ParseQuery(q); err != nil {
			return "", "", bad("bad query")
		}
		dsn = "file:" + strings.TrimPrefix(v, "file:")
		dsn, _, _ = strings.Cut(dsn, "?")
		dsn, _, _ = strings.Cut(dsn, "#")
	} else {
		if v == "" {
			return "", "", bad("empty")
		}
		// In a URI, ? # and % in the path would start the query, the
		// fragment or an escape: escape them so that the file is the one
		// named.
		path, query = v, url.Values{}
		esc := strings.NewReplacer("%", "%25", "?", "%3f", "#", "%23").Replace(v)
		if strings.HasPrefix(v, "/") {
			dsn = "file://" + esc
		} else {
			dsn = "file:" + esc
		}
	}
	has := func(pragma string) bool {
		for _, p := range query["_pragma"] {
			if strings.HasPrefix(strings.ToLower(strings.TrimSpace(p)), pragma) {
				return true
			}
		}
		return false
	}
	if !has("journal_mode") {
		query.Add("_pragma", "journal_mode(WAL)")
	}
	if !has("synchronous") {
		query.Add("_pragma", "synchronous(NORMAL)")
	}
	return dsn + "?" + query.Encode(), path, nil
}

func or(v, def string) string {
	if v == "" {
		return def
	}
	return v
}

// mysqlForms says what --mysql takes, for its errors.
const mysqlForms = "go-sql-driver's DSN user:pass@tcp(host:port)/db[?params], or a URL mysql://user:pass@host[:port]/db[?params]"

// mysqlDSN turns what --mysql was given into go-sql-driver's DSN: a
// mysql:// (or mariadb://) URL is rewritten, port 3306 by default; the
// driver's own form is kept as it is, but a host:port not wrapped in
// tcp(...) is refused here, naming the form wanted, where the driver would
// say "default addr for network '127.0.0.1:3306' unknown".
func mysqlDSN(v string) (string, error) {
	bad := func(why string) error { return fmt.Errorf("--mysql %q: %s; want %s", v, why, mysqlForms) }
	if strings.HasPrefix(v, "mysql://") || strings.HasPrefix(v, "mariadb://") {
		u, err := url.Parse(v)
		if err != nil {
			return "", bad("not a URL")
		}
		if u.Hostname() == "" {
			return "", bad("no host")
		}
		host := u.Host
		if u.Port() == "" {
			host = net.JoinHostPort(u.Hostname(), "3306")
		}
		var cred string
		if u.User != nil {
			cred = u.User.Username()
			if p, ok := u.User.Password(); ok {
				cred += ":" + p
			}
			cred += "@"
		}
		dsn := cred + "tcp(" + host + ")/" + strings.TrimPrefix(u.Path, "/")
		if u.RawQuery != "" {
			dsn += "?" + u.RawQuery
		}
		return dsn, nil
	}
	if v == "" {
		return "", bad("empty")
	}
	base, _, _ := strings.Cut(v, "?")
	if scheme, _, ok := strings.Cut(base, "://"); ok {
		return "", bad(fmt.Sprintf("a URL of scheme %q", scheme))
	}
	i := strings.LastIndex(base, "/")
	if i < 0 {
		return "", bad("no /db")
	}
	addr := base[:i]
	if j := strings.LastIndex(addr, "@"); j >= 0 {
		addr = addr[j+1:]
	}
	if addr != "" && !strings.HasSuffix(addr, ")") && strings.ContainsAny(addr, ":.") {
		return "", bad(fmt.Sprintf("the address %q is not wrapped in tcp(...)", addr))
	}
	return v, nil
}
