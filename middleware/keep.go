package middleware

// DefaultKeep is the default Options.Keep: it reports whether a response
// with this status is an answer that a retry of the same request cannot
// change, and is therefore recorded and replayed. It keeps 2xx and 3xx
// (the work was done; its answer, or where to find its result) and the
// 4xx that find fault with the request itself: 400, 406, 410, 411, 413,
// 414, 415, 417, 422, 428 and 431. It keeps no answer that says the work
// did not happen and may happen on a later try: no 5xx, no other 4xx
// (credentials, routing, timing, the state of the resource or of
// something else), no status of unknown meaning. None of the statuses the
// client package's transport retries (409, 429, 500, 502, 503, 504) is
// kept. The table of Keep rules in the package documentation gives each
// status and why.
//
// A Keep that extends it: func(s int) bool { return s == 402 || middleware.DefaultKeep(s) }.
func DefaultKeep(status int) bool {
	switch {
	case 200 <= status && status < 400:
		return true
	}
	switch status {
	case 400, // Bad Request: the request is malformed
		406, // Not Acceptable: its Accept headers ask for what is not served
		410, // Gone: for good, unlike 404
		411, // Length Required
		413, // Content Too Large
		414, // URI Too Long
		415, // Unsupported Media Type
		417, // Expectation Failed
		422, // Unprocessable Content: the request is invalid
		428, // Precondition Required: it lacks a condition
		431: // Request Header Fields Too Large
		return true
	}
	return false
}
