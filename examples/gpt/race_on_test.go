//go:build race

package gpt

const raceEnabled = true
