package node

// OpenRunning is openRunning for the external tests of this package.
var OpenRunning = openRunning
