from mfuscope.cli import console_main

console_main()
