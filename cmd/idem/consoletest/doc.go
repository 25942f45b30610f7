// Package consoletest drives idem console (the idem command's operator's
// console) in headless Chromium: a key quarantined by real crashes (child
// processes killed with SIGKILL mid-work) on Redis and on Postgres, seen,
// opened and settled in the browser, and the next Do replaying the
// operator's result; requests without the access token, without the CSRF
// token and from another origin refused with no state changed. It is a
// module of its own so that the browser driver (chromedp) is no dependency
// of the idem module. The package has no API: its tests are the point.
//
// The tests need chromium on PATH (Debian's chromium package;
// .ci/services.sh install puts it there), IDEM_REDIS_ADDR and
// IDEM_POSTGRES_DSN; without them they skip, except under CI=true, where
// they fail. IDEM_CONSOLE_SCREENSHOTS=1 rewrites the screenshots in the
// repository's docs/ (console-*.png).
package consoletest
