"""A module that starts a thread when imported: no preloading runner forks it."""
import threading
import time

threading.Thread(target=time.sleep, args=(3600,), daemon=True).start()
