// Package layers holds the test of the rules docs/ARCHITECTURE.md lists
// (section Rules): which package of any module of the tree, and which file
// of package idem, may use which; and, across modules, that a nested
// module imports only the root module and middleware/rpcproto (the RPC
// core's protobuf half), and nothing internal to them. It reads
// the code's imports and, resolved by the type checker, the identifiers
// each non-test file uses, and names the file and identifier of each use a
// rule forbids. It ships nothing.
package layers
