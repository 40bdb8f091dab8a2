package main

import "github.com/kvselect/kvselect/internal/logwatch"

// logBuffer collects the JSON log lines a kvselect process writes.
type logBuffer = logwatch.Buffer

// listeningAddr returns the addr of the startup line in JSON logs, if written.
func listeningAddr(logs string) (string, bool) {
	return logwatch.Attr(logs, "kvselect listening", "addr")
}
