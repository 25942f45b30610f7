// Package storeopts turns the options every store shares (idem.Options)
// into a store's own flat literal, for code that holds the shared ones: a
// storetest Backend's Open, the command's flags.
package storeopts

import "github.com/idemgo/idem"

// Redis returns RedisOptions with o's shared fields; the Redis-only fields
// are left zero for the caller to set.
func Redis(o idem.Options) idem.RedisOptions {
	return idem.RedisOptions{Retention: o.Retention, LeaseTTL: o.LeaseTTL, Worker: o.Worker,
		MaxKeyBytes: o.MaxKeyBytes, MaxResultBytes: o.MaxResultBytes, Logger: o.Logger,
		Observer: o.Observer, KeyHasher: o.KeyHasher, RevealKeys: o.RevealKeys}
}

// SQL returns SQLOptions with o's shared fields and dialect d.
func SQL(o idem.Options, d idem.Dialect) idem.SQLOptions {
	return idem.SQLOptions{Retention: o.Retention, LeaseTTL: o.LeaseTTL, Worker: o.Worker,
		MaxKeyBytes: o.MaxKeyBytes, MaxResultBytes: o.MaxResultBytes, Logger: o.Logger,
		Observer: o.Observer, KeyHasher: o.KeyHasher, RevealKeys: o.RevealKeys, Dialect: d}
}
