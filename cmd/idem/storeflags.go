package main

import (
	"errors"
	"flag"
	"fmt"
	"slices"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/sqlstore"
)

// The environment variables that stand in for the connection flags, one per
// store. A flag given on the command line wins over its variable.
const (
	envRedisAddr    = "IDEM_REDIS_ADDR"
	envClusterAddrs = "IDEM_REDIS_CLUSTER_ADDRS"
	envPostgresDSN  = "IDEM_POSTGRES_DSN"
	envMySQLDSN     = "IDEM_MYSQL_DSN"
	envSQLiteFile   = "IDEM_SQLITE_FILE"
	envTable        = "IDEM_TABLE"
	envRedisPrefix  = "IDEM_REDIS_PREFIX"
	// envRedisURLOld is the Redis variable of earlier releases, read when
	// envRedisAddr is unset, with a note that it is deprecated: bench read
	// envRedisAddr and the other commands this one, for the same Redis.
	envRedisURLOld = "IDEM_REDIS_URL"
)

// The forms a store flag accepts, for its help and its errors.
const (
	redisForms   = "host:port, redis://[user:pass@]host:port[/db], rediss://... (TLS) or unix:///path"
	clusterForms = "comma-separated host:port or redis:// URLs"
	sqliteForms  = "a file path, or a file: URI such as file:/var/lib/idem.db?_pragma=busy_timeout(5000)"
)

// storeKinds is the set of stores a command accepts: it registers their
// flags and no others, so that --help lists only what the command takes.
type storeKinds uint8

const (
	kindRedis storeKinds = 1 << iota
	kindCluster
	kindPostgres
	kindSQLite
	kindMySQL
	// kindNames adds --prefix (with a Redis kind) and --table (with a SQL
	// kind): how a store names its records.
	kindNames

	kindsSQL = kindPostgres | kindMySQL | kindSQLite | kindNames
	kindsAll = kindRedis | kindCluster | kindsSQL
)

// storeFlags are the connection flags shared by the commands. At most one
// of redis, cluster, postgres, mysql and sqlite may be set; none means the embedded
// Redis where a command allows it.
type storeFlags struct {
	redisAddr, cluster, postgres, mysql, sqlite string
	table, prefix                               string
	// fromEnv maps each store flag whose default came from the
	// environment to its variable: a store flag given on the command line
	// overrides the other stores' variables (a shell that exports them all
	// still runs idem demo --sqlite x.db).
	fromEnv map[string]string
	// redisFromOld is set when --redis defaults to envRedisURLOld.
	redisFromOld bool

	// What chooseStore read: the chosen store's flag name ("" for none) and
	// its parsed address.
	kind                  string
	redisOpts             *redis.Options
	clusterOpts           *redis.ClusterOptions
	sqliteDSN, sqlitePath string
}

// register defines on fs the connection flags of the stores kinds names,
// with defaults from the environment.
func (f *storeFlags) register(fs *flag.FlagSet, getenv func(string) string, kinds storeKinds) {
	f.fromEnv = map[string]string{}
	env := func(name, v string) string {
		if val := getenv(v); val != "" {
			f.fromEnv[name] = v
			return val
		}
		return ""
	}
	if kinds&kindRedis != 0 {
		def := env("redis", envRedisAddr)
		if def == "" && getenv(envRedisURLOld) != "" {
			def, f.redisFromOld = env("redis", envRedisURLOld), true
		}
		fs.StringVar(&f.redisAddr, "redis", def, "a Redis `ADDR`: "+redisForms+" (env "+envRedisAddr+")")
	}
	if kinds&kindCluster != 0 {
		fs.StringVar(&f.cluster, "cluster", env("cluster", envClusterAddrs), "a Redis Cluster's masters, `ADDRS`: "+clusterForms+" (env "+envClusterAddrs+")")
	}
	if kinds&(kindRedis|kindCluster) != 0 && kinds&kindNames != 0 {
		fs.StringVar(&f.prefix, "prefix", or(getenv(envRedisPrefix), idem.DefaultPrefix), "the Redis key `prefix` of the store (env "+envRedisPrefix+")")
	}
	if kinds&kindPostgres != 0 {
		fs.StringVar(&f.postgres, "postgres", env("postgres", envPostgresDSN), "a Postgres `DSN`: postgres://user@host:port/db or 'host=... dbname=...' (env "+envPostgresDSN+")")
	}
	if kinds&kindMySQL != 0 {
		fs.StringVar(&f.mysql, "mysql", env("mysql", envMySQLDSN), "a MySQL or MariaDB `DSN` of go-sql-driver/mysql: user:pass@tcp(host:port)/db[?interpolateParams=true], or mysql://user:pass@host:port/db (env "+envMySQLDSN+")")
	}
	if kinds&kindSQLite != 0 {
		fs.StringVar(&f.sqlite, "sqlite", env("sqlite", envSQLiteFile), "a SQLite database `FILE`: "+sqliteForms+" (env "+envSQLiteFile+")")
	}
	if kinds&(kindPostgres|kindMySQL|kindSQLite) != 0 && kinds&kindNames != 0 {
		fs.StringVar(&f.table, "table", or(getenv(envTable), sqlstore.DefaultTable), "the SQL `table` of the store (env "+envTable+")")
	}
}

// chooseStore runs after fs is parsed and before any I/O: it lets a store
// flag given on the command line override the other stores' environment
// variables, reads the chosen store's address, and says once on stderr that
// envRedisURLOld is deprecated when the command is about to use it. Its
// error is a usage error.
func (c *cli) chooseStore(cmd string, fs *flag.FlagSet, f *storeFlags) error {
	explicit := givenFlags(fs)
	type given struct{ flag, value string }
	var set []given
	for _, g := range []given{{"redis", f.redisAddr}, {"cluster", f.cluster}, {"postgres", f.postgres}, {"mysql", f.mysql}, {"sqlite", f.sqlite}} {
		if g.value != "" {
			set = append(set, g)
		}
	}
	if explicit["redis"] || explicit["cluster"] || explicit["postgres"] || explicit["mysql"] || explicit["sqlite"] {
		set = slices.DeleteFunc(set, func(g given) bool { return !explicit[g.flag] })
	}
	switch {
	case len(set) > 1 && !explicit[set[0].flag]:
		var vars []string
		for _, g := range set {
			vars = append(vars, f.fromEnv[g.flag])
		}
		return fmt.Errorf("%s each name a store: give one store flag (--redis, --cluster, --postgres, --mysql or --sqlite) or unset all but one", strings.Join(vars, " and "))
	case len(set) > 1:
		return errors.New("give at most one of --redis, --cluster, --postgres, --mysql and --sqlite")
	case len(set) == 0:
		return nil
	}
	f.kind = set[0].flag
	var err error
	switch f.kind {
	case "redis":
		if !explicit["redis"] {
			c.noteOldRedisEnv(cmd, f)
		}
		f.redisOpts, err = parseRedisAddr("--redis", f.redisAddr)
	case "cluster":
		f.clusterOpts, err = parseClusterAddrs("--cluster", f.cluster)
	case "postgres":
		if postgresDriver == "" {
			err = fmt.Errorf("--postgres: this idem was built with -tags %s, without the Postgres driver; build it without that tag", tagNoPostgres)
		}
	case "mysql":
		if mysqlDriver == "" {
			err = fmt.Errorf("--mysql: this idem was built with -tags %s, without the MySQL driver; build it without that tag", tagNoMySQL)
		} else {
			f.mysql, err = mysqlDSN(f.mysql)
		}
	case "sqlite":
		if sqliteDriver == "" {
			err = fmt.Errorf("--sqlite: this idem was built with -tags %s, without the SQLite driver; build it without that tag", tagNoSQLite)
		} else {
			f.sqliteDSN, f.sqlitePath, err = sqliteDSN(f.sqlite)
		}
	}
	return err
}

// givenFlags returns the names of the flags given on the command line, as
// opposed to those left at their defaults.
func givenFlags(fs *flag.FlagSet) map[string]bool {
	given := map[string]bool{}
	fs.Visit(func(fl *flag.Flag) { given[fl.Name] = true })
	return given
}

// noteOldRedisEnv says on stderr that envRedisURLOld is deprecated when
// --redis, about to be used without being given, has its value from it.
func (c *cli) noteOldRedisEnv(cmd string, f *storeFlags) {
	if f.redisFromOld {
		fmt.Fprintf(c.stderr, "idem %s: note: %s is deprecated and will be dropped; set %s (it takes the same URL, or host:port)\n",
			cmd, envRedisURLOld, envRedisAddr)
	}
}

// parseRedisAddr reads a Redis address given to the flag name: a redis://,
// rediss:// or unix:// URL, or a bare host:port. Its errors name the flag

// envHelp documents the environment variables of the flags that kinds
// registers, for a command's --help.
func envHelp(kinds storeKinds) string {
	var vars, flags []string
	add := func(v, f string) { vars, flags = append(vars, v), append(flags, f) }
	if kinds&kindRedis != 0 {
		add(envRedisAddr, "--redis")
	}
	if kinds&kindCluster != 0 {
		add(envClusterAddrs, "--cluster")
	}
	if kinds&(kindRedis|kindCluster) != 0 && kinds&kindNames != 0 {
		add(envRedisPrefix, "--prefix")
	}
	if kinds&kindPostgres != 0 {
		add(envPostgresDSN, "--postgres")
	}
	if kinds&kindMySQL != 0 {
		add(envMySQLDSN, "--mysql")
	}
	if kinds&kindSQLite != 0 {
		add(envSQLiteFile, "--sqlite")
	}
	if kinds&(kindPostgres|kindMySQL|kindSQLite) != 0 && kinds&kindNames != 0 {
		add(envTable, "--table")
	}
	s := "Environment: " + strings.Join(vars, ", ") + " stand in for " + strings.Join(flags, ", ") +
		"; a flag wins over its variable, and a store flag over the other stores' variables."
	if kinds&kindRedis != 0 {
		s += " " + envRedisURLOld + ", the former name of " + envRedisAddr + ", is still read (deprecated)."
	}
	return wrap(s, 80)
}

// wrap breaks s into lines of at most width characters, at spaces.
func wrap(s string, width int) string {
	var b strings.Builder
	n := 0
	for i, w := range strings.Fields(s) {
		switch {
		case i == 0:
		case n+1+len(w) > width:
			b.WriteByte('\n')
			n = 0
		default:
			b.WriteByte(' ')
			n++
		}
		b.WriteString(w)
		n += len(w)
	}
	return b.String()
}
